"""Errors that mean "the user's input is wrong": one line, naming the culprit and the fix."""


class UserError(Exception):
    """Bad input from the user: one-line message, CLI exit code 2."""
