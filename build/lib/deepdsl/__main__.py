from deepdsl.cli import main

main()
