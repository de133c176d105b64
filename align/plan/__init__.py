"""What `auto` leaves to the device, resolved where the device is known, and the training-memory
estimate those resolutions are counted by (docs/architecture.md, "The plan")."""
