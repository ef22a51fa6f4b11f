import sys

from pynvmf.cli import main

sys.exit(main())
