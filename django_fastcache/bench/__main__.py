"""``python -m django_fastcache.bench``: cachebench without a Django project.

Django is configured with minimal settings unless DJANGO_SETTINGS_MODULE names a project;
the arguments are those of ``manage.py cachebench``.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    import django
    from django.conf import settings

    if not os.environ.get("DJANGO_SETTINGS_MODULE") and not settings.configured:
        settings.configure(INSTALLED_APPS=[], USE_TZ=True, SECRET_KEY="cachebench")
    django.setup()
    from django_fastcache.management.commands.cachebench import Command

    Command().run_from_argv(["cachebench", "cachebench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
