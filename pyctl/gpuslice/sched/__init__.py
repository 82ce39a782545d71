"""The scheduler daemon: channel sources, activity probes, gating, the watchdog and RM controls."""
