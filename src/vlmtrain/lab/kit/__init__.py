"""The lab's kit: what every experiment is made of."""
