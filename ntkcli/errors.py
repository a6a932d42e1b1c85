"""The one exception a user can cause: the CLI prints its message on one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (recipe, flag, path, device); the message is one sentence."""


def first_line(err: BaseException) -> str:
    """An exception's message cut to its first line (its type's name when it has none), for one-line errors."""
    return str(err).splitlines()[0] if str(err).strip() else type(err).__name__


def root_cause(err: BaseException) -> BaseException:
    """The innermost exception an error was raised from (a library's wrapper hides the reason in its cause)."""
    while err.__cause__ is not None or (err.__context__ is not None and not err.__suppress_context__):
        err = err.__cause__ or err.__context__
    return err
