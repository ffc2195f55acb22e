"""What each filesystem call means, by store key, without FUSE: the operations the session
calls (:mod:`zarrfs.fs.api`), the namespace over a driver, listings, open files, spill buffers,
side data and the one errno table. Imports and tests without a mount."""
