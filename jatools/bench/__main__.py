import sys

from jatools.bench.harness import main

sys.exit(main())
