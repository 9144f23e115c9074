"""Plausible wrong answers to FM-7's exercise: fixes an engineer would write that do not hold (``lab.exercise``)."""
