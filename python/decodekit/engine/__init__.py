"""Engine core: requests, the paged KV-cache block manager (prefix caching) and the scheduler."""
from .kv_cache import BlockPool, KVCacheManager, sha256_block_hash
from .request import Request, RequestStatus, split_n
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput, ScheduledRequest

__all__ = ["BlockPool", "KVCacheManager", "sha256_block_hash", "Request", "RequestStatus", "split_n",
           "Scheduler", "SchedulerConfig", "SchedulerOutput", "ScheduledRequest"]
