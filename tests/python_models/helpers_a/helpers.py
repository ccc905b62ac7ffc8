WHO = "a"
