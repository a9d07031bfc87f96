"""Settings of the example project: one site, every cache backend, chosen by environment.

``EXAMPLE_CACHE`` picks the backend behind ``CACHES["default"]`` (and so behind the
per-view cache, the template fragment cache and the sessions):

    locmem | filebased | memcached (alias: pylibmc) | pymemcache | redis | diskcache |
    fastcache (memcached only) | fastcache-tiered (with its disk tier)

Without it: ``fastcache-tiered`` when memcached answers at ``EXAMPLE_MEMCACHED``, else
``locmem`` (see cache_choice.py). The WSGI entry point (gunicorn, and runserver, which
loads it) prints the choice.

The servers come from ``EXAMPLE_MEMCACHED`` (``host:port`` or ``unix:/path``, default
127.0.0.1:11211) and ``EXAMPLE_REDIS`` (default redis://127.0.0.1:6379/1); directory-based
caches live under ``EXAMPLE_CACHE_DIR``.

``manage.py cachebench`` ignores this choice: its rows start their own servers, unless
``CACHEBENCH_BACKENDS`` says otherwise (see the end of this file).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from example_project import cache_choice

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("EXAMPLE_SECRET_KEY", "example-project-not-for-production")
DEBUG = os.environ.get("EXAMPLE_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]
USE_TZ = True
# Django sets the process' TZ from TIME_ZONE (default America/Chicago): keep the gunicorn
# workers' log times in the same zone as the master's.
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django_fastcache",  # manage.py cachebench
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
]
ROOT_URLCONF = "example_project.urls"
# A view that fails (a cache server that is not there, say) prints its traceback on stderr,
# that is in gunicorn's log, even with DEBUG off: a load test's 500s then say why.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"handlers": ["stderr"], "level": "ERROR"}},
}
WSGI_APPLICATION = "example_project.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
# No database: the catalogue is generated, and sessions live in the cache.
DATABASES: dict[str, Any] = {}
SESSION_ENGINE = "django.contrib.sessions.backends.cache"

# -- caches -------------------------------------------------------------------------------

MEMCACHED = os.environ.get("EXAMPLE_MEMCACHED", "127.0.0.1:11211")
# Django's memcached backends take a unix socket as a bare path.
MEMCACHED_FOR_DJANGO = MEMCACHED.removeprefix("unix:")
REDIS = os.environ.get("EXAMPLE_REDIS", "redis://127.0.0.1:6379/1")
CACHE_DIR = Path(
    os.environ.get("EXAMPLE_CACHE_DIR", Path(tempfile.gettempdir()) / "example-project-cache")
)

CACHE_BACKENDS: dict[str, dict[str, Any]] = {
    "locmem": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "example",
    },
    "filebased": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(CACHE_DIR / "filebased"),
    },
    "memcached": {
        "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
        "LOCATION": MEMCACHED_FOR_DJANGO,
    },
    "pymemcache": {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": MEMCACHED_FOR_DJANGO,
    },
    "redis": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS,
    },
    "diskcache": {
        "BACKEND": "diskcache.DjangoCache",
        "LOCATION": str(CACHE_DIR / "diskcache"),
    },
    # memcached alone, like PyLibMCCache: the like-for-like comparison (cachebench's
    # "fastcache" row). FastCache keeps a disk tier by default; "fastcache-tiered" has it.
    "fastcache": {
        "BACKEND": "django_fastcache.backends.FastCache",
        "LOCATION": MEMCACHED,
        "OPTIONS": {"disk_tier": False},
    },
    "fastcache-tiered": {
        "BACKEND": "django_fastcache.backends.FastCache",
        "LOCATION": MEMCACHED,
        "OPTIONS": {"disk_directory": str(CACHE_DIR / "fastcache-tiered")},
    },
}
CACHE_BACKENDS["pylibmc"] = CACHE_BACKENDS["memcached"]

CACHE_CHOICE = cache_choice.choose(os.environ, MEMCACHED)
EXAMPLE_CACHE = CACHE_CHOICE.name
if EXAMPLE_CACHE not in CACHE_BACKENDS:
    raise ImproperlyConfigured(
        f"EXAMPLE_CACHE={EXAMPLE_CACHE!r}; choose one of {', '.join(sorted(CACHE_BACKENDS))}"
    )
CACHES = {"default": CACHE_BACKENDS[EXAMPLE_CACHE]}

# -- cachebench ---------------------------------------------------------------------------
# With EXAMPLE_BENCH_SITE_CACHE=1, cachebench adds a row "site" that measures the cache
# this site runs on (CACHES["default"] above), next to its own embedded rows. A row name
# can also map to a whole CACHES-style dict, and a default row's name (e.g. "memcached")
# replaces that row's embedded configuration.
CACHEBENCH_BACKENDS: dict[str, Any] = (
    {"site": "default"} if os.environ.get("EXAMPLE_BENCH_SITE_CACHE") == "1" else {}
)
# Results (tables as JSON and CSV, plots) in the checkout's cachebench-results/, whatever
# directory the command was started from; --output-dir overrides it.
CACHEBENCH_OUTPUT_DIR = BASE_DIR.parent / "cachebench-results"
