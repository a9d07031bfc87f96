"""django-fastcache: a fast memcached cache for Django, with a disk tier behind it."""

__version__ = "0.1.0"
