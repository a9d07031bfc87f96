"""WSGI entry point: gunicorn example_project.wsgi, and runserver, which loads it too."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_wsgi_application()

from django.conf import settings  # noqa: E402  (configured by the line above)

from example_project import cache_choice  # noqa: E402

# Which cache this site runs on, in the server's log: once under runserver (which loads
# this module), once per worker process under gunicorn.
cache_choice.announce(settings.CACHE_CHOICE, settings.CACHES["default"])
