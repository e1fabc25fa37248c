"""The API and service fixtures, for the bad-input suite."""

from tests.api.conftest import api_db_url, env, make_env  # noqa: F401
from tests.service.conftest import keys, redis_available, redis_client  # noqa: F401
