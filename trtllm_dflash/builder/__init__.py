"""dflash-build: turn a target + DFlash drafter into a verified engine directory."""
