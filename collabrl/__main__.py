"""`python -m collabrl ...` is `collab ...`: what `accelerate launch -m collabrl train ...` runs."""

from collabrl.cli import main

if __name__ == "__main__":
    main()
