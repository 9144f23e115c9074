"""One test file per lesson (DESIGN.md §10), and the tests of the lessons as a whole."""
