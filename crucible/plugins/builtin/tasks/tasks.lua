-- A task list in TASKS.md (settings: file). Tasks are markdown checkboxes with optional
-- fields: - [ ] Draft chapter one [id:: ch1] [deps:: outline, research]
local parse = require("parse")
local settings = { file = "TASKS.md" }

local function load()
  if not crucible.note_exists(settings.file) then
    error(settings.file .. " does not exist yet: create it with lines like '- [ ] Task [id:: t1]'")
  end
  local note = crucible.read_note(settings.file)
  return parse.tasks(note.content), note
end

local function by_id(tasks)
  local index = {}
  for _, task in ipairs(tasks) do index[task.id] = task end
  return index
end

return {
  name = "tasks",
  setup = function(cfg)
    if cfg.file ~= nil then settings.file = cfg.file end
  end,
  tools = {
    list_tasks = {
      desc = "The tasks of the task list, with their ids, dependencies and whether they are done.",
      read_only = true,
      params = { { name = "status", type = "string", desc = "open, done or all (default all)", optional = true } },
      fn = function(args)
        local tasks = load()
        local status, out = args.status or "all", {}
        for _, task in ipairs(tasks) do
          if status == "all" or (status == "done") == task.done then out[#out + 1] = task end
        end
        return { file = settings.file, tasks = out }
      end,
    },
    next_task = {
      desc = "The first open task whose dependencies are all done, and which open tasks wait on what.",
      read_only = true,
      params = {},
      fn = function()
        local tasks = load()
        local index, waiting = by_id(tasks), {}
        for _, task in ipairs(tasks) do
          if not task.done then
            local missing = {}
            for _, dep in ipairs(task.deps) do
              if not (index[dep] and index[dep].done) then missing[#missing + 1] = dep end
            end
            if #missing == 0 then return { task = task, waiting = waiting } end
            waiting[#waiting + 1] = { id = task.id, waits_on = missing }
          end
        end
        return { task = nil, waiting = waiting, message = #waiting == 0 and "every task is done" or "every open task waits on another" }
      end,
    },
    mark_done = {
      desc = "Tick a task as done, by its id.",
      params = { { name = "id", type = "string", desc = "the task's [id:: ...]" } },
      fn = function(args)
        local tasks, note = load()
        local task = by_id(tasks)[args.id]
        if not task then error("no task with id '" .. args.id .. "' in " .. settings.file) end
        if task.done then return { id = task.id, done = true, changed = false } end
        crucible.write_note(settings.file, parse.tick(note.content, task.line), note.content_hash)
        return { id = task.id, done = true, changed = true }
      end,
    },
  },
}
