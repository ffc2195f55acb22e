"""The daemon: one mount served (:mod:`zarrfs.daemon.main`, ``serve``) and its housekeeping: the
status socket (``control``), logging (``logs``), systemd's notifications (``sdnotify``), the
mountpoints of killed daemons (``deadmount``). Nothing is imported here, so that the command
line can ask a daemon (``control``) without importing the filesystem."""
