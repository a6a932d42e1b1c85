"""The one exception a user can cause: the CLI prints its message on one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (recipe, flag, path, device); the message is one sentence."""
