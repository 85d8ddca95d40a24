"""Every KFP component of the package, in one place: thin wrappers that turn the libraries below
(``components.s3_sync``, ``components.launcher``, ``components.evaluate``) into KFP v2 components
on our image.

- ``factory``: a plain, self-contained function → a lightweight component on the image;
- ``function``: a KFP function written from a declaration (signature + docstring ``Args``);
- ``s3_sync``, ``launcher``, ``evaluate``: each library's component factories (``make_*_op``).

Each factory takes the container image as a compile-time setting. The pipeline's own steps are
``pipelines/steps.py``; ``kfp-ddp compile-components`` writes all of them to
``components/compiled``.
"""
