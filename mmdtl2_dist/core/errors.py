"""Exceptions of the core."""


class QPSolveError(RuntimeError):
    """A quadratic program could not be solved to the requested accuracy.

    Raised instead of leaking a solver's own status codes. The message names the
    solver, its status and the KKT residuals it reached.
    """
