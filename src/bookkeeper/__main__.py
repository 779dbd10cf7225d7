from bookkeeper.admin.cli import main

main()
