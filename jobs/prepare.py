"""Ray job entrypoint: tokenizer + TFRecord shards (CPU cluster).

    ray job submit --working-dir . -- python jobs/prepare.py --config jobs/configs/quickstart.yaml
"""

import sys

from _entry import main

if __name__ == "__main__":
    sys.exit(main("prepare"))
