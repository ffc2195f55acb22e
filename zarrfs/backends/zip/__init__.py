"""Zip archives as folders: ``zip:///path/data.zip`` (:class:`~.driver.ZipDriver` in ``driver``,
declared in ``about``)."""
