"""The kernel's FUSE protocol: ABI tables and the opcode table (abi), the dispatch of requests
(dispatch), INIT negotiation (handshake), the session that turns requests into
:mod:`zarrfs.fs.api` calls, the request loop, the channel libfuse mounts, the node table and
notifications. Of the filesystem it imports only :mod:`zarrfs.fs.api`."""
