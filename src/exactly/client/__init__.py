"""Client-side helpers shared by the ``exactly`` command line tools."""
