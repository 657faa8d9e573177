"""Notebook 13: write a schedule as text (workbench), graded exercises, zb-auto memory sweep."""
