def main():
    raise SystemExit("dflash-bench: not built yet")
