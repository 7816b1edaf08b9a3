import sys

from speedboard.cli import main

sys.exit(main())
