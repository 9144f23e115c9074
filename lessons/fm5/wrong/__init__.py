"""Plausible wrong answers to FM-5's exercise: fixes an engineer would write that do not hold (``lab.exercise``)."""
