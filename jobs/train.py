"""Ray job entrypoint: training on existing shards.

    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/quickstart.yaml
"""

import sys

from _entry import main

if __name__ == "__main__":
    sys.exit(main("train"))
