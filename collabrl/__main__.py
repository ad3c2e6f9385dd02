"""`python -m collabrl ...` is `collab ...`: what `accelerate launch -m collabrl train ...` runs."""

from collabrl.cli.main import main

if __name__ == "__main__":
    main()
