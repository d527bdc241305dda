from fabric.cli.main import main

main()
