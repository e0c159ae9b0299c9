-- job_submit.lua: placeholder that logs each submission and lets everything through.
-- Only a fallback: slurmgpu.lab.cluster.render installs plugins/job_submit.lua (the
-- slurmgpu plugin) instead whenever this package runs from a source tree that has it
-- (a checkout, the docker image); an installed wheel gets this placeholder.
-- Loaded by JobSubmitPlugins=lua from slurm.conf's directory.
function slurm_job_submit(job_desc, part_list, submit_uid)
   slurm.log_info("job_submit.lua: name=%s uid=%s", tostring(job_desc.name), tostring(submit_uid))
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
