"""What goes where: the machine (hardware), model sizes, the plan, recommendations."""
