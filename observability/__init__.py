"""What every vm-autoscaling process shares about being observed: its log set-up."""
