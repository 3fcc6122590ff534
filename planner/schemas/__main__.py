from planner.schemas import write

for path in write():
    print(path)
