"""The exceptions kolo raises, named as Horovod names them so that
`except hvd.HorovodInternalError` in existing scripts keeps working."""


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank: a peer died, the ranks disagreed
    (mismatched shapes, dtypes, ops), the job is shutting down. In elastic
    training the state is restored from the last commit and the ring is
    rebuilt."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; raised at the next commit or host-update
    check so that elastic training re-forms the ring without a rollback.
    `skip_sync` is True when the new workers need no state broadcast."""

    def __init__(self, skip_sync=False):
        super().__init__("the set of hosts changed")
        self.skip_sync = skip_sync


KoloError = HorovodInternalError
