"""Plausible wrong answers to FM-1's exercise: fixes an engineer would write that do not hold (``lab.exercise``)."""
