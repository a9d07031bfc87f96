"""Fixtures that run Django's own cache test classes against a real memcached.

A test class here subclasses Django's ``BaseMemcachedTests`` (see ``fetch.py``) and names its
backend in class attributes (``MemcachedSuiteMixin`` in the test module)::

    @pytest.mark.usefixtures("django_cache_suite")
    class FastCacheTests(MemcachedSuiteMixin, BaseMemcachedTests, django.test.TestCase):
        backend = "django_fastcache.backends.FastCache"
        backend_options = {"operation_timeout": 0.5}  # the OPTIONS; None: no OPTIONS key
        # location(server) -> the LOCATION string, server.location by default
        # options(directory) -> the OPTIONS, backend_options by default; directory is a
        # fresh temporary directory of the class's own (for a disk tier)

For the whole class, ``django_cache_suite`` points every cache alias of Django's suite at one
node of the session's memcached processes (``_memcached_processes`` in tests/conftest.py),
the way Django's own memcached test classes are configured, and installs the suite's app.
The settings are applied by a fixture rather than a class decorator because the memcached
port is only known once the session's servers are running.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils.module_loading import import_string

from tests.conftest import forget_stacks
from tests.django_suite.fetch import installed_apps_with_suite, load_cache_tests

if TYPE_CHECKING:
    from tests.conftest import MemcachedCluster


@pytest.fixture(scope="session")
def _django_cache_suite_tables(django_db_setup: None, django_db_blocker: Any) -> None:
    """Create the table of the suite's Poll model in the test database, once.

    The test database is created before the suite's app is installed (the app is only
    installed around its test classes), so the table is created here directly. Session
    scope makes this run before any test class opens its transaction.
    """
    suite = load_cache_tests()
    poll = suite.Poll
    with django_db_blocker.unblock():
        if poll._meta.db_table in connection.introspection.table_names():
            return
        with connection.schema_editor() as editor:
            editor.create_model(poll)


@pytest.fixture(scope="class")
def django_cache_suite(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    _memcached_processes: MemcachedCluster,
    _django_cache_suite_tables: None,
) -> Iterator[None]:
    """Configure CACHES (and INSTALLED_APPS) for one of Django's cache test classes."""
    cls = request.cls
    assert cls is not None, "django_cache_suite is for test classes"
    suite = load_cache_tests()
    # Importing the backend up front turns a missing or broken backend into one clear error.
    import_string(cls.backend)
    server = _memcached_processes.tcp[0]
    server.flush()
    params: dict[str, Any] = {"BACKEND": cls.backend, "LOCATION": cls.location(server)}
    directory = tmp_path_factory.mktemp(cls.__name__)
    options = cls.options(directory)
    if options is not None:
        params["OPTIONS"] = dict(options)
    cls.memcached_server = server
    cls.base_params = params  # BaseMemcachedTests reads it to build more settings
    caches = suite.caches_setting_for_tests(base=params, exclude=suite.memcached_excluded_caches)
    try:
        with override_settings(CACHES=caches, INSTALLED_APPS=installed_apps_with_suite()):
            yield
    finally:
        forget_stacks(directory)
