"""What several test files share: checks, peers, input makers, the made-up op (tests/conftest.py puts
tests/ on sys.path, so that a test imports them as helpers.<name>)."""
