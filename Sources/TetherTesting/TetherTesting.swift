// Test kit shipped as a product: in-process servers and misbehaving servers.
