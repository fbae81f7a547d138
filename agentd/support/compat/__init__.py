"""Other libraries' private parts, one module per library, each part behind one named
function: the only place agentd touches what a library does not promise to keep.

``tests/support/test_compat.py`` checks each part against the installed release and fails
naming the library's version when a release changes what a function relies on; the
ranges in pyproject.toml are the releases those tests passed on.
"""
