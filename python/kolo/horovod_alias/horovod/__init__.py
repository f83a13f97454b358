"""horovod as kolo: this folder's parent on PYTHONPATH makes `import
horovod.torch` give kolo.torch (see kolo/as_horovod.py)."""
__kolo_alias__ = True

import kolo.as_horovod  # noqa: E402,F401  (fills this package and its submodules)
