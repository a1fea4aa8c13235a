"""What the tests share that is not a fixture: tiny models and the test pair, oracles, fakes and scripted parts."""
