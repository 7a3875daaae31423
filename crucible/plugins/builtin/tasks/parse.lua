-- Parse and edit the lines of a task list:  - [ ] Title [id:: a] [deps:: b, c]
local parse = {}

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

function parse.line(text, number)
  local indent, mark, rest = text:match("^(%s*)[-*] %[([ xX])%]%s*(.*)$")
  if not mark then return nil end
  local task = { line = number, done = mark ~= " ", deps = {} }
  task.id = rest:match("%[id::%s*([^%]]-)%s*%]")
  local deps = rest:match("%[deps::%s*([^%]]-)%s*%]")
  if deps then
    for dep in deps:gmatch("[^,%s]+") do task.deps[#task.deps + 1] = dep end
  end
  task.title = trim((rest:gsub("%[%w+::[^%]]*%]", "")))
  task.id = task.id and trim(task.id) or ("line-" .. number)
  return task
end

function parse.tasks(content)
  local tasks, number = {}, 0
  for text in (content .. (content:sub(-1) == "\n" and "" or "\n")):gmatch("(.-)\n") do
    number = number + 1
    local task = parse.line(text, number)
    if task then tasks[#tasks + 1] = task end
  end
  return tasks
end

-- The content with line `number`'s checkbox ticked.
function parse.tick(content, number)
  local out, n = {}, 0
  for text in (content .. (content:sub(-1) == "\n" and "" or "\n")):gmatch("(.-)\n") do
    n = n + 1
    if n == number then text = text:gsub("%[ %]", "[x]", 1) end
    out[#out + 1] = text
  end
  return table.concat(out, "\n") .. "\n"
end

return parse
