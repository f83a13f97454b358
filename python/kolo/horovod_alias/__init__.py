"""The folder holding the `horovod` alias package (kolo/as_horovod.py):
put this folder on PYTHONPATH, not import it."""
