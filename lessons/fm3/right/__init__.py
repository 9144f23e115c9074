"""Correct answers to FM-3's exercise written another way than the lab's fix: the check passes them alike."""
