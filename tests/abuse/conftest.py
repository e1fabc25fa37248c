"""The API fixtures of tests/api, for the bad-input suite."""

from tests.api.conftest import api_db_url, env, make_env  # noqa: F401
