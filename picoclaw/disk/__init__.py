"""Files on disk, safely: where a write through a link lands (links.py), atomic replacement (atomic.py), bounded
reads (bounded_read.py), time-stamped names (stamped.py), a file's identity and values kept by it
(file_identity.py), and appends a crash cannot tear (appends.py). Import each from its module."""
