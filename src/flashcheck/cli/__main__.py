"""python -m flashcheck.cli"""

from flashcheck.cli import main

main()
