"""The S3 tests' fixtures live in tests/conftest.py: ``s3_server`` (the session's SeaweedFS),
``s3_env``, ``bucket`` and ``moto_server`` (for keys SeaweedFS refuses): other areas use them too.
"""
