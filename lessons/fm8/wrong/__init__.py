"""Plausible wrong answers to FM-8's exercise: fixes an engineer would write that do not hold (``lab.exercise``)."""
