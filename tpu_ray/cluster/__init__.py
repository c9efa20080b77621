"""Where the work runs on Ray: placement of training, multi-worker training, Ray jobs."""
