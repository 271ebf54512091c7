"""The data error type, apart from the tables so that torch- and pandas-free code can raise it."""


class DataError(ValueError):
    """Bad input data: the message names the file/column and the reason."""
