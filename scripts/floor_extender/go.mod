module vm-autoscaling/floor-extender

go 1.22
